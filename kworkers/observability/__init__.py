"""What an operator looks at: the Grafana dashboard and the Prometheus alert rules, from code.

Why from code: a hand-written dashboard or rules file drifts from the metrics it reads, and a
renamed metric silently empties a panel or disables an alert. Here the queries are data
(``panels.py``, ``alerts.py``, pure), the committed files (``deploy/grafana/kworkers.json``,
``deploy/prometheus/alerts.yml``) are rendered from them (``python -m kworkers.observability``),
unit tests fail when the files and the code differ, and an integration test evaluates every
query against a real Prometheus scraping a real worker.
"""
