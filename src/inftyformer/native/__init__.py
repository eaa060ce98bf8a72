"""The native model: Transformer-XL, the Compressive Transformer and the ∞-former on one
backbone (`MemoryLM`), trained from scratch.

    model_config.py       ModelConfig: one config, the memories nested (memory_settings.py)
    short_term_memory.py  the last m states per layer (Transformer-XL)
    compressive_memory.py the compressed slots (Compressive Transformer)
    state.py              MemoryState: the explicit state of every memory, per layer and row
    state_record.py       what a state records of the memory that made it
    relative_attention.py attention over [short-term memory; segment], relative positions
    kl_term.py            the reads' variance KL as a term of the loss
    block.py              one block: relative attention + the long-term read + FFN
    model.py              MemoryLM: four model types on one backbone
    streaming.py          any length in segments (stream_loss, generate)
"""
