"""fabric-cpu-single-bf16: image classification training project rendered by scaffold."""
