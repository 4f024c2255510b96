"""The thin layer between DAG files and the library: task bodies, operators, notifiers."""
