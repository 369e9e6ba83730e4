"""``gym view``: a read-only web page over runs (overview, steps, rollouts, compare, live).

Everything a page shows comes from model output and is untrusted: the templates autoescape,
embedded data is JSON read with ``JSON.parse``, and routes name runs and rows by number, never by
path, so nothing outside the files of the runs given on the command line can be served.
"""
