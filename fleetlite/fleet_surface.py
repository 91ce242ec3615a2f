"""The names of `paddle.distributed.fleet` that fleetlite does not provide, and why.

Asking `fleetlite` for one raises an AttributeError that gives the reason and the alternative,
instead of Python's bare "has no attribute". docs/fleet_compatibility.md is the full table; a
test checks that every public name of Paddle's fleet module is either provided or listed here.
"""
_PARAMETER_SERVER = "parameter-server training is not supported (fleetlite trains collectively)"
_PS_TABLES = "it operates on parameter-server tables; " + _PARAMETER_SERVER
_PS_DATA = ("it feeds parameter-server training through Paddle's C++ data feed; feed numpy batches "
            "to Executor.run (each rank its own slice of the global batch)")
_HYBRID = ("it belongs to hybrid parallelism (tensor, pipeline, sharding), which fleetlite does "
           "not do: it is data parallel only")
_FEDERATED = "it belongs to federated (coordinator) training, a parameter-server mode; " + _PARAMETER_SERVER
_LOG_LEVEL = ("it sets the log level of Paddle's fleet logger, which fleetlite does not use; "
              "fleetlite prints its compile report on rank 0 and its errors as exceptions")

UNSUPPORTED = {
    "BoxPSDataset": _PS_DATA, "DatasetBase": _PS_DATA, "FileInstantDataset": _PS_DATA,
    "InMemoryDataset": _PS_DATA, "QueueDataset": _PS_DATA,
    "MultiSlotDataGenerator": _PS_DATA, "MultiSlotStringDataGenerator": _PS_DATA,
    "CommunicateTopology": _HYBRID,
    "HybridCommunicateGroup": ("fleetlite builds none from a CommunicateTopology (hybrid parallelism is not "
                               "supported); fleet.get_hybrid_communicate_group() returns the dp-only one"),
    "Fleet": "the fleetlite module itself is the fleet object (`fleetlite.fleet` is the module); "
             "there is no class to instantiate or subclass",
    "UtilBase": "it is the class of `fleet.util`; use `fleet.util` itself",
    "init_server": _PARAMETER_SERVER, "run_server": _PARAMETER_SERVER, "server_index": _PARAMETER_SERVER,
    "init_coordinator": _FEDERATED, "is_coordinator": _FEDERATED, "make_fl_strategy": _FEDERATED,
    "get_fl_client": _FEDERATED,
    "check_save_pre_patch_done": _PS_TABLES, "save_cache_model": _PS_TABLES,
    "save_cache_table": _PS_TABLES, "save_dense_params": _PS_TABLES, "save_one_table": _PS_TABLES,
    "load_one_table": _PS_TABLES, "print_table_stat": _PS_TABLES, "set_date": _PS_TABLES,
    "shrink": _PS_TABLES,
    "load_inference_model": ("Fleet's loads a model into parameter-server tables; in a collective job "
                             "every rank reads the directory fleet.save_inference_model wrote with "
                             "paddle.static.load_inference_model(os.path.join(dirname, 'model'), exe)"),
    "collective_perf": "Paddle's collective micro-benchmark; fleetlite's is benchmarks/gradsync/gradsync.py",
    "local_device_ids": ("it reads the legacy launcher's PADDLE_LOCAL_DEVICE_IDS; use fleet.local_rank() "
                         "and FLAGS_selected_gpus, which fleetrun sets per worker"),
    "world_device_ids": ("it reads the legacy launcher's PADDLE_WORLD_DEVICE_IDS; fleetrun gives each "
                         "worker its own device (FLAGS_selected_gpus)"),
    "set_log_level": _LOG_LEVEL, "get_log_level_code": _LOG_LEVEL, "get_log_level_name": _LOG_LEVEL,
    "check_memory_usage": "it logs device memory through Paddle's fleet logger; use paddle.device.cuda.memory_allocated",
    "load": ("Paddle 3's fleet has no load; read what fleet.save_persistables (or fleet.save) wrote with "
             "fleet.load_model(dirname)"),
}


def missing(name):
    """The AttributeError for a Fleet name fleetlite does not provide."""
    return AttributeError(f"fleetlite does not provide fleet.{name}: {UNSUPPORTED[name]} "
                          f"(docs/fleet_compatibility.md)")
