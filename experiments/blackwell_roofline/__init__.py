"""Roofline model of decode on H100/H200/B200 (perfmodel.py), validated against jaxserve's measured step."""
