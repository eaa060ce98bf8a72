"""What the commands of `inftyformer` do once their options are read: one module per command
(`train`, `evaluate`, `generate`, `inspect`), each running it and printing its result.
`inftyformer.cli` declares the commands and their options and calls these."""
