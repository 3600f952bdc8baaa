"""The ceilings a roofline is placed against: the device's peaks and their source (device_ceilings),
the cache of measured ones (ceiling_cache) and the lookup that picks one (ceiling_lookup). Empty on
purpose: importing one does not import the others through here."""
