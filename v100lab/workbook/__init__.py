"""The workbook: scenarios, display, plots, one lever module per notebook, the notebook runner and fleet."""
