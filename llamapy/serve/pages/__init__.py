"""The browser pages: the chat page and the live dashboard (``static/``: plain JS modules and
vendored libraries), the dashboard's feed (``live_view``: ``/v1/llamapy/events``) and what each
API key sees of the server (``tenant_view``)."""
