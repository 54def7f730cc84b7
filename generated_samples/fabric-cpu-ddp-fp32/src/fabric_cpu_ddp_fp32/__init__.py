"""fabric-cpu-ddp-fp32: image classification training project rendered by scaffold."""
