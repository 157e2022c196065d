"""``python -m sgl_ess.launch_server [SGLang flags] [--ess-* flags] [--ess-config FILE.yaml]``

Runs the real SGLang server (tokenizer manager, scheduler, model runner, HTTP) with the ESS
overlay. With no arguments it serves the embedded tiny DeepSeek-V3.2 model (random weights)
on 127.0.0.1:30000 with ESS on. ``--help`` lists SGLang's flags and the ESS ones. ``--ess-explain``
prints the SGLang arguments and the ESS plan after every pre-load check, and exits 0 without loading
anything (``--ess-explain-device cuda:8:141`` plans for an 8 x H200 node from any machine).
"""

if __name__ == "__main__":
    from sgl_ess.integration.sglang.launcher.server_args import main

    main()
