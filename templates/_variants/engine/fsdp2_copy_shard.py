def copy_shard(target: Tensor, full: Tensor) -> None:
    """`build.init_weights`'s `store` under FSDP2: a sharded parameter keeps its rank's piece
    of the full tensor, cut as `fully_shard` cut it (dim 0, in world-size chunks); anything
    not sharded, all of it."""
    if isinstance(target, DTensor):
        piece = distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None)
        target.to_local().copy_(piece.to_local())
    else:
        target.copy_(full)
