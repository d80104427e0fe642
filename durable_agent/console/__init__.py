"""Internal: the console (``durable-agent console``), a web page and a JSON API to watch, approve,
steer and rewind runs; not part of the public API (that is ``durable_agent.__all__``).

``app.py`` builds the Starlette application and serves it, ``auth.py`` guards every request
(token, cookie, CSRF, Content-Security-Policy), ``runs.py`` lists a task queue's runs, ``api.py``
answers ``/api/``'s reads and ``actions.py`` its actions, ``files.py`` reads diffs and exports
from the sink; ``static/`` and ``templates/`` are the page, shipped as they are (no build step).
"""
