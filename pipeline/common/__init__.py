"""The ground floor: what every stage uses and which uses no stage.

Errors the CLI turns into one line (``errors``), figures for people (``units``), what the
operating system says (``system``), text for a terminal (``terminal``), TOML files and their
declared keys (``tomlfile``, ``tomlschema``), Parquet schemas as data and atomic writes
(``schemas``), resource limits and the progress channel (``budget``), the names and defaults
``--help`` shows (``defaults``), the prefix cache's block hash (``blockhash``), printing tables
(``tables``) and the package's own import graph (``layout``). Nothing is re-exported here: each
module is imported by name, so importing one never loads the others (``rooftrace --help`` loads
``defaults`` and ``errors`` only).
"""
