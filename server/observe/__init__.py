"""What the node tells about itself beyond its answers: the engines' metrics in Prometheus
text, each request's timings, and the engine trace. (The HTTP layer's own counters stay in
observe/metrics.py, which is compiled with the hot path.)"""
