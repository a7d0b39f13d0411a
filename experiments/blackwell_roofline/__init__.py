"""Roofline model of decode on H100/H200/B200 (jaxserve.perfmodel), validated against jaxserve's measured step."""
