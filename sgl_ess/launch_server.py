"""``python -m sgl_ess.launch_server [SGLang flags] [--ess-* flags] [--ess-config FILE.yaml]``

Runs the real SGLang server (tokenizer manager, scheduler, model runner, HTTP) with the ESS
overlay. With no arguments it serves the embedded tiny DeepSeek-V3.2 model (random weights)
on 127.0.0.1:30000 with ESS on. ``--help`` lists SGLang's flags and the ESS ones.
"""

if __name__ == "__main__":
    from sgl_ess.integration.sglang.launcher.server_args import main

    main()
