"""Audit artefacts: result files and (later) the PDF report."""
