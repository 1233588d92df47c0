"""The page scripts, run by ``st.navigation`` (``app.py``, listed in ``dashboard/navigation.py``);
never imported: each draws its page when it runs. Their helpers are in ``dashboard/``."""
