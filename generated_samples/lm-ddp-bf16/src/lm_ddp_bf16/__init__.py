"""lm-ddp-bf16: language model training project rendered by scaffold."""
