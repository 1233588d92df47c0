"""Audit artefacts: result files, image grids, the plotly figures and the PDF report."""
