"""k8s: the Kubernetes adapter, manifests and a real local API server for tests. Not built yet."""
