"""Glue to other tools: lm-evaluation-harness models and tasks (the native and pretrained
memories' evaluation, `harness.py`, `lm_eval.py`), RULER's needle tasks on the package's novels
(`ruler_haystack.py`, `ruler_tasks/`) and the retrieval as an lm_eval model (`ruler_lm.py`)."""
