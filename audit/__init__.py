"""Privacy auditing library: membership-inference attacks and their settings (knows nothing about OpenFL)."""
