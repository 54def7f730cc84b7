"""lm-fsdp2-bf16: language model training project rendered by scaffold."""
