"""Drop-in modules for inference engines (docs/INTEGRATION.md).

  sglang  load: the --custom-weight-loader function; SGLangController
  vllm    DteWorkerExtension: the worker_extension_cls; VLLMController
  vllm_transfer  the "dted" backend of vLLM's weight transfer
          (WeightTransferConfig(backend="dted")), registered by the
          vllm.general_plugins entry point: register()

Both apply a version on every worker of an engine or on none (two phases
over dted's staging, see _engine.py), and their controllers report what
they did and where every worker stands.  Importing them needs neither
SGLang nor vLLM.
"""
