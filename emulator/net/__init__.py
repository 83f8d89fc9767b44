"""The live network (needs root): emulation lifecycle, links, OVS, shaping, monitors, the controller process."""
