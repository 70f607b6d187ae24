"""Reference code for dayzero tests: format emulation, checkpoint writers, tokenizer files."""
