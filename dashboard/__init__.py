"""The Streamlit dashboard: UI only, every decision is ``auditlib``'s.

``pages/`` holds the page scripts ``app.py`` registers (``navigation.py`` lists them); they
only lay out widgets and call the helpers here, one job each:

- ``resources``: the process-wide store and run manager; ``state``: what survives a page
  switch, a refresh and a shared link (form fields, the URL).
- ``setup_state``: the Setup page's choices and their checks; ``uploads``: its uploads.
- ``run_choices``: the Attack lab's choices and the ``RunSpec`` they make; ``forms`` the
  sidebar forms of the lab, Compare and Trade-off; ``config_form`` a form for any config
  dataclass of an attack or defense.
- ``stored_runs``: what the pages read of a stored run (its typed result, spec, verdict);
  ``spec_words``, ``result_words``, ``verdict_words``: those in words, with the metric
  catalogue's labels and formats; ``image_display``: images at their natural size.
- ``run_live`` and ``run_result``: the lab's view of a run in progress and of its result;
  ``batch_view`` and ``batch_table``: the view of a comparison or sweep.
"""
