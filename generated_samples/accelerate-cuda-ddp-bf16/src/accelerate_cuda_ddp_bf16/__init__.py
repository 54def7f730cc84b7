"""accelerate-cuda-ddp-bf16: image classification training project rendered by scaffold."""
