    # Task: byte-level language model.
    block_size: int = 64
    corpus_bytes: int = 300_000
    text_path: str = ""
    task_positive_keys: ClassVar[tuple[str, ...]] = ("block_size", "corpus_bytes")