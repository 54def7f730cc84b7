    def full_state_dict(self) -> dict[str, Tensor]:
        """The whole, unsharded state dict on the CPU of every rank (a collective; keys without
        wrapper prefixes).

        Every rank holds all of it at once: for a model larger than one host's memory, convert
        a checkpoint offline with `torch.distributed.checkpoint.format_utils.dcp_to_torch_save`.
        """
        options = StateDictOptions(full_state_dict=True)
        full_state = get_model_state_dict(self.model, options=options)
        return {name: value.cpu() for name, value in full_state.items()}