"""A Django app for the anarchon_worker subprocesses of the RabbitMQ and NATS worker tests."""
