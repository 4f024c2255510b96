"""Act: the executors, the one dispatch step, the effect guard, notices and their channels."""
