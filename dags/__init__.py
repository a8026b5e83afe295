"""trainpipe's Airflow DAG files (the dags/ folder), shipped so an installed trainpipe can run them."""
