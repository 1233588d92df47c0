"""The dashboard's pages and their helpers (UI only: they call auditlib)."""
