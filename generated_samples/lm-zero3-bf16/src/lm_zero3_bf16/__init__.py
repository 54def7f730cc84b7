"""lm-zero3-bf16: language model training project rendered by scaffold."""
