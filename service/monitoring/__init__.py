"""What operators watch the toolkit with: the Grafana dashboard, built in code
(:mod:`service.monitoring.dashboard`). The alert rules are data, in ``k8s/monitoring/``."""
