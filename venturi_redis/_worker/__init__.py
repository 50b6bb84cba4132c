"""_worker"""
