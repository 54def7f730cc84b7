"""cuda-zero1-bf16: image classification training project rendered by scaffold."""
