"""Protocol sources (.proto) and the modules generated from them."""
