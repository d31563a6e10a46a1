"""The streaming merge engine: one merge loop over the tensors, a path per kind of tensor and device."""
