"""cuda-ddp-fp16: image classification training project rendered by scaffold."""
