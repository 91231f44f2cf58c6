"""The hostile-input suite (issue 20): a real broker process fed malformed requests, HTTP/2
abuse, schema bombs and damaged storage, while a separate process keeps asking HealthCheck."""
