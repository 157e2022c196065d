"""``python -m sgl_ess.launch_pd [--decode-nodes N] [--ports LO-HI] [-- server flags]``

A prefill/decode deployment on this machine: one prefill server, N ESS decode servers and SGLang's
router in front (sgl_ess/serving/pd_cluster.py). ``--help`` explains every flag.
"""

if __name__ == "__main__":
    import sys

    from sgl_ess.serving.pd_cluster import main

    sys.exit(main())
