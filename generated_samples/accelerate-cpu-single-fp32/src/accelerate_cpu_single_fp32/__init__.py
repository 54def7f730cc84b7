"""accelerate-cpu-single-fp32: image classification training project rendered by scaffold."""
