"""Solution: what happened to one model between two scrapes of the metrics page (notebook 10)."""


def answer(before: str, after: str, model: str) -> dict:
    def grew(name: str) -> float:
        """How much counter ``name`` of ``model`` grew between the two pages (every label set of the model)."""
        def value(page: str) -> float:
            total = 0.0
            for line in page.splitlines():
                # e.g. nv_inference_count{model="cost_model",version="1"} 8
                if line.startswith(name + "{") and f'model="{model}"' in line:
                    total += float(line.rsplit(" ", 1)[1])
            return total
        return value(after) - value(before)  # counters are cumulative: the window is the difference

    executions = grew("nv_inference_exec_count")  # cache hits never run the model
    return {
        "requests": grew("nv_inference_request_success"),  # every answered request, hits included
        "cache_hits": grew("nv_cache_num_hits_per_model"),
        "executions": executions,
        "avg_batch": grew("nv_inference_count") / executions,  # inferences = rows of executed requests
    }
