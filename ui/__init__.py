"""Gradio panels built outside app.py, each called from app.py's build_ui in one line.

    from ui.lm_steer import build_lm_steer_tab
    build_lm_steer_tab(bench)          # inside gr.Blocks: the "LM steering" tab

A panel takes the app's Workbench (for its shared model cache) but imports nothing from app.py;
it reaches the packages (interp, saes, flowlens) as app.py does.
"""
