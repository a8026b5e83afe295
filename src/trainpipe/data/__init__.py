"""The data layer: reading tabular data (``tabular``), the checks training needs of it (``preconditions``), and
above them drift, Feast training sets, scoring and splits. Nothing heavy at import."""
