"""Our engine behind SGLang's HTTP protocol: ``python -m core.inference.server`` (app.py: the
routes, start-up and arguments; generate_endpoint.py and sglang_params.py: ``/generate`` as
SGLang reads it; chat_endpoint.py: ``/v1/chat/completions``; weight_sync_endpoints.py: the
weight updates; validation.py: every request body checked, naming the field; guard.py: auth,
the weight-path allow-list, request isolation)."""
