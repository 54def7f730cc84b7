    # Task: image classification on the 8x8 digits.
    augment: bool = True
    task_positive_keys: ClassVar[tuple[str, ...]] = ()