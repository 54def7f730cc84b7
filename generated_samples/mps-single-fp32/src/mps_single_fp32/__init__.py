"""mps-single-fp32: image classification training project rendered by scaffold."""
