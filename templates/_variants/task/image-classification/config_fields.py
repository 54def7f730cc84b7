    # --- task: the example's data and schedule; yours to change with data.py and model.py ---
    run_dir: str = "runs/digits"
    val_fraction: float = 0.2
    augment: bool = True
    dropout: float = 0.1
    epochs: int = 30
    micro_batch_size: int = {{ plan.micro_batch_size.python }}
    min_lr_ratio: float = 0.05
    warmup_steps: int = {{ plan.warmup_steps.python }}
    weight_decay: float = 0.05
    early_stop_patience: int = 5
    task_positive_keys: ClassVar[tuple[str, ...]] = ()
    # data settings a resume must keep (resume.py): they fix what the checkpoint trained on
    task_resume_keys: ClassVar[tuple[str, ...]] = ()
    # --- end of the task's section ---
