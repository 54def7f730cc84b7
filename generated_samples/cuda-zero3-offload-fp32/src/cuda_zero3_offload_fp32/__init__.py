"""cuda-zero3-offload-fp32: image classification training project rendered by scaffold."""
