"""commdiag's NCCL tuner plugin: per-size algorithm/protocol rules that stock NCCL applies.

An environment variable (NCCL_PROTO, NCCL_ALGO) applies one choice to every message size; a
tuner plugin chooses per collective and size.  This part owns:

* ``commdiag_tuner.c`` + ``commdiag_tuner_api.h``: the plugin (exports ncclTunerPlugin_v6..v2;
  the header says which NCCL release looks for which),
* ``build.py``: compiling it here with the system C compiler (``commdiag tuner build``),
* ``rules.py``: the rules file it reads (``NCCL_TUNER_CONFIG_FILE``), parsed exactly as the plugin does.
* ``fromrun.py``: rules from a run folder's certified per-size winners (``commdiag tuner rules``).

docs/tuner.md is the manual: the rules format, what the plugin logs, the channel trap of NCCL's
example plugin, rules from a sweep, and what is still to come.
"""
