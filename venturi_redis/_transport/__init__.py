"""_transport"""
