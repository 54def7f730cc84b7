"""fabric-lm-fsdp2-fp32: language model training project rendered by scaffold."""
