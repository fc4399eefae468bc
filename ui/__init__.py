"""The app's tabs, one module per tab, each called from app.py's build_ui in one line (ui/common.py: what they
share). A tab module has `build_<tab>_tab(bench)` (its gr.Tab, widgets and events, inputs passed by name) and a
`<Tab>Tab` class holding its state and handlers:

    from ui.lm_steer import build_lm_steer_tab
    build_lm_steer_tab(bench)          # inside gr.Blocks: the "LM steering" tab

A tab takes the app's Workbench (its shared model cache and the sessions) but imports nothing from app.py;
it reaches the packages (interp, saes, riebench, flowlens) as app.py does.
"""
