    # --- task: the example's data and schedule; yours to change with data.py and model.py ---
    run_dir: str = "runs/stdlib-lm"
    val_fraction: float = 0.1
    text_path: str = ""
    corpus_bytes: int = {{ plan.corpus_bytes.python }}
    block_size: int = {{ plan.block_size.python }}
    dropout: float = 0.0
    epochs: int = 4
    micro_batch_size: int = {{ plan.micro_batch_size.python }}
    min_lr_ratio: float = 0.1
    warmup_steps: int = {{ plan.warmup_steps.python }}
    weight_decay: float = 0.1
    early_stop_patience: int = 3
    task_positive_keys: ClassVar[tuple[str, ...]] = ("block_size", "corpus_bytes")
    # data settings a resume must keep (resume.py): they fix what the checkpoint trained on
    task_resume_keys: ClassVar[tuple[str, ...]] = ("block_size", "corpus_bytes", "text_path")
    # --- end of the task's section ---
